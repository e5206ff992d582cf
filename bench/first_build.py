"""The pipeline's first build of the serving index (a new lake's, or one whose index was lost),
phase by phase, on a generated lake; with `--anchor`, SQLite's own bulk load of the same events.

    python -m bench.first_build --events 10000000 [--workdir /var/tmp/bench-first-build] [--anchor]

Generates (once per workdir) a lake whose raw log holds `generate_events(N, seed=7)`, written by
delta-rs 200,000 events at a time, then, on a hard-linked copy (lakes.py), brings its serving
index up from nothing as the pipeline does (`refresh_serving_index` at the default hot window)
and prints the seconds of each phase its progress lines mark (load, indexes, projections,
segments with the pins and the copy-out, the file written whole), with this process's and the
machine's other CPU meanwhile, and the index's and segments' bytes. `--anchor` then loads the
same events into a SQLite BEL (`load_events`: indexes built once, at the end), the reference
backend's bulk load, for the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from bench.lakes import link_tables, write_events
from bench.measuring import Row, measure, print_rows
from bench.serving_index import sqlite_of_lake
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.runtime.lake import Lake
from databuild_assets.workload import generate_events

BATCH = 200_000
# The progress line that ends each phase, in order.
_PHASES = (
    ("load the raw log", "events loaded; hiding"),
    ("indexes of events", "events indexed"),
    ("projections", "indexes and projections built"),
    ("segments", "the events that stay copied out"),
    ("written whole (VACUUM)", "written whole without"),
)


def generated_lake(workdir: Path, events: int) -> Lake:
    """A lake of `events` generated events under `workdir`, made once."""
    lake, done = Lake(str(workdir / "lake")), workdir / f"generated-{events}"
    if done.exists():
        return lake
    shutil.rmtree(workdir / "lake", ignore_errors=True)
    for stale in workdir.glob("generated-*"):  # the lake of another size, gone
        stale.unlink()
    for _ in write_events(lake, generate_events(events, seed=7), BATCH):
        pass
    done.touch()
    return lake


def first_build(lake: Lake, copy: Path) -> list[Row]:
    """The phases of a first build on a copy of `lake` at `copy`, from its progress lines."""
    shutil.rmtree(copy, ignore_errors=True)
    link_tables(Path(lake.root), copy)
    marks: list[float] = []
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(f"  {time.perf_counter() - started:7.1f} s  {line}", flush=True)
        if len(marks) < len(_PHASES) and _PHASES[len(marks)][1] in line:
            marks.append(time.perf_counter() - started)

    status, usage = measure(lambda: refresh_serving_index(Lake(str(copy)), progress))
    starts = [0.0, *marks[:-1]]
    rows = [Row(name, end - start) for (name, _), start, end in zip(_PHASES, starts, marks)]  # noqa: B905
    rows.append(Row("the rest (stamp, publish)", usage.wall - (marks[-1] if marks else 0.0)))
    note = f"index {status.bytes / 1e6:,.1f} MB, {status.segments} segments {status.segment_bytes / 1e6:,.1f} MB"
    return [*rows, Row.of("first build", usage, events=status.events, note=note)]


def sqlite_load(lake: Lake, path: Path, events: int) -> Row:
    """SQLite's own bulk load of the lake's `events` events into a new BEL at `path`."""
    path.unlink(missing_ok=True)
    _, usage = measure(lambda: sqlite_of_lake(lake, path))
    return Row.of("SQLite's bulk load (anchor)", usage, events=events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workdir", default="/var/tmp/bench-first-build")
    parser.add_argument("--anchor", action="store_true", help="also SQLite's bulk load of the same events")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    lake = generated_lake(workdir, args.events)
    rows = first_build(lake, workdir / "copy")
    total = rows[-1].seconds
    if args.anchor:
        rows.append(sqlite_load(lake, workdir / "anchor.db", rows[-1].events))
    print_rows(f"First build of the serving index, {args.events:,} generated events", rows, total)
    shutil.rmtree(workdir / "copy", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
