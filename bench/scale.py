"""What a change costs on a 1M, a 3M and a 10M-event history, and at 100M on paper (issue 30).

    python -m bench.scale                      # lakes under /var/tmp/bench-scale, built when missing
    python -m bench.scale --size 1000000=/var/tmp/bench-check-1000000/lake --size 10000000=/var/tmp/lake-10m

For each size, smallest first, on a working copy of its lake (`bench.lakes`: data files
hard-linked, the Delta logs and the serving index copied; the lake itself is not changed and
serves the next run), in one Spark session with the warm driver's settings:

1. Landing-file runs, each file through what the pipeline's run does: `ingest_landing_files`
   (by key lookup on the serving index up to `dedup.KEY_LOOKUP_LIMIT` events), the filtered log's
   refresh, the three projections' refresh and the serving index's catch-up, each step timed:
   two 1,000-event files first (untimed warm-up), then three 40-event files (36 new events and 4
   redelivered a day later; medians), a +0.1% and a +1% file (N/1,000 and N/100 new events a few
   days after the history; ingestion throughput is theirs).
2. A full rebuild of the three projections, and the +0.1% and +1% refreshes' share of it.
3. Freshness with the daemon: `bench.freshness --in-place --arrival idle` on the copy (`dagster
   dev`, every sensor on, `--freshness-files` landing files of 40 events, each landing once no
   run is in flight): p50 and p95 seconds from a landing file to partition_state.
4. One erasure, a build request, for good: the tombstone and the three refreshes `erase_job`
   runs, `compact` (the files its purge rewrote of the files each table had), the next 40-event
   file's run after the purge, and vacuum with retention 0 (it deletes what the purge and
   compaction removed, as vacuum does once the retention has passed).

Then one table, a column per size, the largest size's figures over the smallest's, and 100M on
paper: each time's least-squares line in the history's events (a + b·N, a falling one read as
flat) at 100M, the ratios computed from those. A lake missing is built first with
`databuild-assets demo --events N` in a JVM of its own (its time printed) and kept. Nothing is
asserted about speed; a file that does not add the events it carries stops the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.erasure import first_build_request
from bench.lakes import copy_serving_index, link_tables
from bench.measuring import load_average
from bench.refresh_at_scale import events_after
from bench.small_batches import NEW, events_in, landing_file, some_stored_events
from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.maintenance.vacuum import vacuum_lake
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.lake import Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload.encoding import encode_json

REPO = Path(__file__).resolve().parents[1]
SIZES = (1_000_000, 3_000_000, 10_000_000)
PAPER = 100_000_000
STEPS = ("ingest", "filtered log", "projections", "serving index")
BATCHES = ("40 events", "+0.1%", "+1%")


def timed(figures: dict, label: str, action):
    start = time.perf_counter()
    result = action()
    figures[label] = time.perf_counter() - start
    return result


def landing_run(spark, lake: Lake, write, expected: int) -> dict[str, float]:
    """One landing file (`write(folder)` writes it) through the pipeline run's steps, timed."""
    steps: dict[str, float] = {}
    write(Path(lake.landing))
    result = timed(steps, "ingest", lambda: ingest_landing_files(spark, lake, settle_seconds=0))
    if result.accepted != expected:
        raise SystemExit(f"{lake.root}: a landing file added {result.accepted} events, not {expected}: {result}")
    timed(steps, "filtered log", lambda: refresh_filtered_log(spark, lake))
    timed(steps, "projections", lambda: refresh_all_projections(spark, lake))
    timed(steps, "serving index", lambda: refresh_serving_index(lake))
    return steps


def generated_file(lake: Lake, n: int, seed: int, days_later: int):
    """A writer of a landing file of `n` new events, `days_later` days after the history."""
    events = events_after(lake, n, seed=seed, days_later=days_later)

    def write(folder: Path) -> None:
        hidden = folder / f".scale-{uuid.uuid4().hex}.jsonl"
        hidden.write_text("".join(encode_json(event) + "\n" for event in events))
        hidden.rename(folder / hidden.name[1:])

    return write


def print_steps(label: str, steps: dict[str, float]) -> None:
    print(f"  {label:<28} " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in steps.items()), flush=True)


def measure(spark, lake: Lake, size: int, freshness_files: int) -> dict[str, float | str]:
    """Every figure of one size, on the working copy `lake` (which it changes)."""
    figures: dict[str, float | str] = {}
    stored = some_stored_events(lake, 4)
    for seed in (1, 2):  # the JVM's first Delta jobs compile: the first size would pay it in its figures
        print_steps("warm-up (1,000 events)", landing_run(spark, lake, generated_file(lake, 1_000, seed, 2), 1_000))
    small = [landing_run(spark, lake, lambda f: landing_file(f, stored), NEW) for _ in range(3)]
    for steps in small:
        print_steps("40 events", steps)
    for name in STEPS:
        figures[f"40 events: {name}"] = statistics.median(steps[name] for steps in small)
    figures["40 events: run"] = statistics.median(sum(steps.values()) for steps in small)
    for number, (label, n) in enumerate((("+0.1%", size // 1_000), ("+1%", size // 100))):
        steps = landing_run(spark, lake, generated_file(lake, n, 10 + number, 4 + 2 * number), n)
        print_steps(f"{label} ({n:,} events)", steps)
        figures.update({f"{label}: {name}": seconds for name, seconds in steps.items()})
        figures[f"{label}: events"] = n
    timed(figures, "projections: full rebuild", lambda: refresh_all_projections(spark, lake, full=True))
    print(f"  {'full rebuild':<28} projections {figures['projections: full rebuild']:.1f} s", flush=True)
    if freshness_files:  # before the erasure, whose compaction and vacuum commits would start runs of their own
        figures.update(freshness(lake, freshness_files))

    build_request = first_build_request(lake)
    erasure: dict[str, float] = {}
    tombstone = lambda: request_erasure(spark, lake, "build_request_id", build_request, "bench", "bench")  # noqa: E731
    timed(erasure, "tombstone", tombstone)
    timed(erasure, "filtered log", lambda: refresh_filtered_log(spark, lake))
    timed(erasure, "projections", lambda: refresh_all_projections(spark, lake))
    timed(erasure, "serving index", lambda: refresh_serving_index(lake))
    result = timed(erasure, "compact", lambda: compact(spark, lake))
    print_steps(f"erasure of {build_request}", erasure)
    figures.update({f"erasure: {name}": seconds for name, seconds in erasure.items()})
    figures["erasure: files rewritten"] = ", ".join(
        f"{t.table} {t.files_rewritten}/{t.before.num_files}" for t in result.tables if t.rows_purged
    )
    stored = some_stored_events(lake, 4)  # the erased build request's events are gone
    after = landing_run(spark, lake, lambda f: landing_file(f, stored), NEW)
    print_steps("40 events after the purge", after)
    figures["after the purge: 40-event run"] = sum(after.values())
    vacuumed = timed(
        figures,
        "vacuum, retention 0",
        lambda: vacuum_lake(spark, lake, retention_hours=0, minimum_retention_hours=0, allow_short_retention=True),
    )
    figures["vacuum: files deleted"] = f"{sum(v.files_deleted for v in vacuumed):,}"
    print(f"  {'vacuum':<28} {figures['vacuum, retention 0']:.1f} s, {figures['vacuum: files deleted']} files")
    return figures


def freshness(lake: Lake, files: int) -> dict[str, float]:
    """p50 and p95 from `bench.freshness --in-place` on the copy (its output shown indented)."""
    command = [sys.executable, "-m", "bench.freshness", "--lake", lake.root, "--in-place", "--arrival", "idle"]
    command += ["--files", str(files)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    summary = None
    for line in process.stdout:
        print(f"    {line}", end="", flush=True)
        if line.startswith("{"):
            summary = json.loads(line)
    if process.wait() != 0 or summary is None:
        print(f"  bench.freshness exited with {process.returncode}: no freshness figures for {lake.root}")
        return {}
    return {f"freshness p{p}": summary["partition_state"][f"p{p}"] for p in (50, 95)}


def derived(column: dict[str, float | str]) -> dict[str, float]:
    """The ratios and rates a column's times give."""
    rows = {}
    full = column.get("projections: full rebuild")
    for label in BATCHES[1:]:
        if isinstance(full, float) and f"{label}: projections" in column:
            rows[f"{label}: projections / full rebuild"] = column[f"{label}: projections"] / full
        if f"{label}: ingest" in column:
            rows[f"{label}: ingestion, events/s"] = column[f"{label}: events"] / column[f"{label}: ingest"]
    return rows


def on_paper(columns: dict[int, dict], at: int) -> dict[str, float]:
    """Each time's least-squares line a + b·N over the sizes measured, read at `at` events."""
    sizes = list(columns)
    paper: dict[str, float | str] = {}
    for label in columns[sizes[-1]]:
        points = [(n, columns[n][label]) for n in sizes if isinstance(columns[n].get(label), float)]
        if len(points) < 2 or label.endswith("events"):
            continue
        mean_n = statistics.fmean(n for n, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        slope = sum((n - mean_n) * (y - mean_y) for n, y in points) / sum((n - mean_n) ** 2 for n, _ in points)
        paper[label] = mean_y + max(slope, 0.0) * (at - mean_n)  # a time falling with size: read as flat
    for label in BATCHES[1:]:
        paper[f"{label}: events"] = at // (1_000 if label == "+0.1%" else 100)
    return paper


def print_table(columns: dict[int, dict]) -> None:
    sizes = list(columns)
    table = {n: {**figures, **derived(figures)} for n, figures in columns.items()}
    paper = on_paper(columns, PAPER) if len(sizes) > 1 else {}
    paper.update(derived(paper))
    labels = list(dict.fromkeys(label for figures in table.values() for label in figures))
    heads = [f"{n / 1e6:g}M" for n in sizes] + ([f"{sizes[-1] / sizes[0]:g}x / 1x"] if len(sizes) > 1 else [])
    heads += ["100M on paper"] if paper else []
    print(f"\n{'seconds unless said':<40}" + "".join(f"{head:>14}" for head in heads))

    def cell(value, label: str) -> str:
        if value is None:
            return f"{'-':>14}"
        if label.endswith("full rebuild") and not label.startswith("projections"):
            return f"{value:>14.1%}"
        return f"{value:>14,.0f}" if value >= 1_000 else f"{value:>14.2f}" if value < 10 else f"{value:>14.1f}"

    texts = [label for label in labels if any(isinstance(table[n].get(label), str) for n in sizes)]
    for label in labels:
        if label in texts:
            continue
        values = [table[n].get(label) for n in sizes]
        cells = [cell(value, label) for value in values]
        if len(sizes) > 1:  # the largest size over the smallest: a plain factor, whatever the row
            first, last = values[0], values[-1]
            cells.append(f"{last / first:>14.2f}" if first and last is not None else f"{'-':>14}")
        if paper:
            cells.append(cell(paper.get(label), label))
        print(f"{label:<40}" + "".join(cells))
    for label in texts:
        print(f"{label}: " + "; ".join(f"{n / 1e6:g}M {table[n].get(label, '-')}" for n in sizes))


def build_lake(size: int, root: Path) -> float:
    """`databuild-assets demo --events size` into `root`; its wall seconds."""
    print(f"building a {size:,}-event lake in {root} with databuild-assets demo", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DATABUILD_LAKE_ROOT": str(root), "DATABUILD_SPARK_DRIVER": "own"}
    env.pop("DAGSTER_HOME", None)
    start = time.perf_counter()
    demo = subprocess.run(
        [str(Path(sys.executable).parent / "databuild-assets"), "demo", "--events", str(size)],
        env=env,
        capture_output=True,
        text=True,
    )
    if demo.returncode != 0:
        raise SystemExit(f"databuild-assets demo --events {size} failed:\n{demo.stderr[-3000:]}")
    print("".join(f"    {line}\n" for line in demo.stdout.splitlines() if "in all" in line or "generated" in line))
    return time.perf_counter() - start


def working_copy(source: Path, target: Path) -> Lake:
    """A copy of `source` that `measure` may change (`bench.lakes`); refused without room for the
    serving index's copy (the only bytes copied)."""
    shutil.rmtree(target, ignore_errors=True)
    index_bytes = sum(f.stat().st_size for f in (source / SERVING_INDEX_FOLDER).glob("**/*") if f.is_file())
    free = shutil.disk_usage(target.parent).free
    if free < index_bytes + 4 * 2**30:
        raise SystemExit(
            f"{target.parent}: {free / 2**30:.1f} GiB free; copying {source}'s serving index needs "
            f"{index_bytes / 2**30:.1f} GiB and 4 GiB to work in"
        )
    link_tables(source, target)
    copy_serving_index(source, target)
    (target / "landing").mkdir()
    return Lake(str(target))


def parse_size(text: str) -> tuple[int, Path | None]:
    size, _, path = text.partition("=")
    return int(size.replace("_", "")), Path(path) if path else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size", action="append", type=parse_size, metavar="N[=LAKE]", help="a size, its lake if not the default"
    )
    parser.add_argument("--lakes", default="/var/tmp/bench-scale", help="where lakes are kept and built")
    parser.add_argument("--freshness-files", type=int, default=10, help="files bench.freshness measures (0: none)")
    parser.add_argument("--keep", action="store_true", help="keep the working copies")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    lakes = Path(args.lakes)
    lakes.mkdir(parents=True, exist_ok=True)
    sizes = sorted(args.size or [(n, None) for n in SIZES])
    built: dict[int, float] = {}
    for size, path in sizes:
        root = path or lakes / f"lake-{size}"
        if not (root / "tables" / "raw_event_log" / "_delta_log").is_dir():
            built[size] = build_lake(size, root)
    spark = build_spark_session(
        SparkSettings(
            app_name="bench-scale",
            driver_memory="4g",
            long_lived=True,
            extra_config={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    columns: dict[int, dict] = {}
    for size, path in sizes:
        source = path or lakes / f"lake-{size}"
        start = time.perf_counter()
        lake = working_copy(source, lakes / f"work-{size}")
        copied = time.perf_counter() - start
        print(f"\n{source}: {events_in(lake):,} events, copied in {copied:.0f} s; {load_average()}")
        columns[size] = measure(spark, lake, size, args.freshness_files)
        if size in built:
            columns[size]["lake built by the demo"] = built[size]
        print(f"  {time.perf_counter() - start:.0f} s in all for this size; {load_average()}")
        if not args.keep:
            shutil.rmtree(lake.root, ignore_errors=True)
    spark.stop()
    print_table(columns)


if __name__ == "__main__":
    main()
